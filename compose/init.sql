-- Run once by the mysql:8.0 image (compose/docker-compose.yml) as root when its data
-- volume is first initialised. Every statement is idempotent, so it can also be run by
-- hand on an existing MySQL 8 or MariaDB server:
--   mysql -h127.0.0.1 -uroot -p < compose/init.sql
--
-- The lock table exactly as locks.backends.database.DatabaseProvider.table() creates it,
-- and a `locks` user allowed only SELECT, INSERT, UPDATE, DELETE on it (the provider then
-- runs with create_table = false: see compose/locks.toml).

CREATE DATABASE IF NOT EXISTS locks CHARACTER SET utf8mb4;

-- `name` takes a binary collation without PAD SPACE, so 'a' and 'a ' are two locks.
-- MySQL 8 calls it utf8mb4_0900_bin, MariaDB utf8mb4_nopad_bin (and knows no 0900
-- collations): the statement is built here to pick the one this server has.
SET @locks_name_collation =
  IF(VERSION() LIKE '%MariaDB%', 'utf8mb4_nopad_bin', 'utf8mb4_0900_bin');
SET @locks_create_table = CONCAT(
  'CREATE TABLE IF NOT EXISTS locks.locks (',
  ' name VARCHAR(255) COLLATE ', @locks_name_collation, ' NOT NULL,',
  ' owner VARCHAR(64) NOT NULL,',
  ' token VARCHAR(64) NOT NULL,',
  ' depth INTEGER NOT NULL,',
  ' fence BIGINT NOT NULL,',
  ' expires_at BIGINT NOT NULL,',  -- microseconds, by the database server's clock
  ' acquired_at BIGINT NOT NULL,',
  ' PRIMARY KEY (name)',
  ') ENGINE=InnoDB CHARSET=utf8mb4');
PREPARE locks_create_table FROM @locks_create_table;
EXECUTE locks_create_table;
DEALLOCATE PREPARE locks_create_table;

-- '%': in Docker the client comes through the bridge network, not from 127.0.0.1
CREATE USER IF NOT EXISTS 'locks'@'%' IDENTIFIED BY 'locks';
GRANT SELECT, INSERT, UPDATE, DELETE ON locks.locks TO 'locks'@'%';
