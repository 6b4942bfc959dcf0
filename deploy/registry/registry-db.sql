-- The Schema Registry's database and user on the deployment's PostgreSQL (docker-compose.yml, registry-db-init):
-- run on every `docker compose up`, so it is idempotent, and it also sets up a postgres-data volume created before
-- the registry existed. The password comes from the environment (\getenv, psql 15+): on no command line.
\set ON_ERROR_STOP on
\getenv registry_password KDQ_REGISTRY_DB_PASSWORD
SELECT 'CREATE ROLE registry LOGIN' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'registry') \gexec
-- Applied every time: a changed KDQ_REGISTRY_DB_PASSWORD takes effect at the next `up`.
ALTER ROLE registry WITH LOGIN PASSWORD :'registry_password';
SELECT 'CREATE DATABASE registry OWNER registry' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'registry') \gexec
