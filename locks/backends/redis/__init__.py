"""The Redis backends: `redis` and `redis-hash`, on one server, a Sentinel-managed
primary or a Cluster (`topology`), with the scripts (`scripts`) and the shared release
subscriber (`notify`) they both use."""

from locks.backends.redis.provider import RedisHashProvider, RedisProvider

__all__ = ["RedisHashProvider", "RedisProvider"]
