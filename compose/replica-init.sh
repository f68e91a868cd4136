# Sourced (bash) by the mysql:8.0 image's entrypoint in compose/replica.yml's
# `mysql-replica`, once, when its data volume is first initialised, after 1-init.sql made
# the lock database, table and user; the temporary server runs without networking, the
# primary (`mysql`, healthy by then) is reached over the Compose network. Afterwards the
# lock database is the primary's, and replication starts with the real server.
# Keep it not executable: the entrypoint sources such files (so docker_process_sql is
# defined here) and runs executable ones on their own.

# the account the replica logs in with, on the primary only (kept out of its binary log)
MYSQL_PWD="$MYSQL_ROOT_PASSWORD" mysql --protocol=tcp -hmysql -uroot <<'EOSQL'
SET SESSION sql_log_bin = 0;
CREATE USER IF NOT EXISTS 'repl'@'%' IDENTIFIED BY 'locks-repl';
GRANT REPLICATION SLAVE ON *.* TO 'repl'@'%';
EOSQL

# forget this server's own transactions (the image's set-up, 1-init.sql): its GTID set is
# to be the primary's alone
docker_process_sql <<<'RESET MASTER;'

# the lock database as the primary has it now, with the GTID set it had then
# (--source-data: a moment's global read lock, so that the two agree)
MYSQL_PWD="$MYSQL_ROOT_PASSWORD" mysqldump --protocol=tcp -hmysql -uroot \
  --single-transaction --source-data=2 --set-gtid-purged=ON --databases locks |
  docker_process_sql

# from there on, by GTID; replication starts with the real server
docker_process_sql <<'EOSQL'
CHANGE REPLICATION SOURCE TO SOURCE_HOST = 'mysql', SOURCE_PORT = 3306,
  SOURCE_USER = 'repl', SOURCE_PASSWORD = 'locks-repl',
  SOURCE_AUTO_POSITION = 1, GET_SOURCE_PUBLIC_KEY = 1, SOURCE_CONNECT_RETRY = 1;
EOSQL
