-- Run by psql as a superuser: once by the postgres:15 image (compose/docker-compose.yml)
-- when its data volume is first initialised, and by scripts/servers at each start. Every
-- statement is idempotent, so it can also be run by hand on an existing PostgreSQL:
--   psql -h 127.0.0.1 -U postgres -d postgres -f compose/postgres-init.sql
--
-- The `locks` database; in it the lock table exactly as
-- locks.backends.database.DatabaseProvider.table() creates it on PostgreSQL, and a
-- `locks` role, no superuser, owning nothing, allowed only to connect to that database
-- and SELECT, INSERT, UPDATE, DELETE on that table (the provider then runs with
-- create_table = false: see compose/locks.toml).

SELECT 'CREATE DATABASE locks'
  WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'locks') \gexec
\connect locks

CREATE TABLE IF NOT EXISTS public.locks (
  name VARCHAR(255) NOT NULL,
  owner VARCHAR(64) NOT NULL,
  token VARCHAR(64) NOT NULL,
  depth INTEGER NOT NULL,
  fence BIGINT NOT NULL,
  expires_at BIGINT NOT NULL,  -- microseconds, by the database server's clock
  acquired_at BIGINT NOT NULL,
  PRIMARY KEY (name)
);

DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'locks') THEN
    CREATE ROLE locks LOGIN PASSWORD 'locks';
  END IF;
END
$$;

-- a new database lets PUBLIC connect and make temporary tables: here only `locks` (and
-- superusers) connect. Schema public: USAGE for PUBLIC, as PostgreSQL 15 has it (no CREATE)
REVOKE ALL ON DATABASE locks FROM PUBLIC;
GRANT CONNECT ON DATABASE locks TO locks;
GRANT SELECT, INSERT, UPDATE, DELETE ON public.locks TO locks;
