"""The degradation layer: chains of backends, circuit breakers and the kill-switch."""

from locks.fallback.breaker import Breaker, BreakerState
from locks.fallback.chain import FallbackChain, default_retry
from locks.fallback.switch import Switch, SwitchState

__all__ = ["Breaker", "BreakerState", "FallbackChain", "Switch", "SwitchState", "default_retry"]
