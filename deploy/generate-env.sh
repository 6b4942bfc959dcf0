#!/usr/bin/env bash
# Writes an .env for docker-compose.yml with a fresh random value for every
# secret (.env.example lists them). Refuses to overwrite an existing file:
# the Postgres, Kafka and InfluxDB secrets are baked into their volumes on
# first start, so regenerating them breaks an existing deployment.
#   deploy/generate-env.sh [path]   (default: .env next to docker-compose.yml)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/.env}
if [[ -e "$out" ]]; then
  echo "$out exists; not overwriting it" >&2
  exit 1
fi
secret() { openssl rand -hex 32; }
# A Fernet key: 32 random bytes, URL-safe base64.
fernet() { openssl rand 32 | base64 | tr '+/' '-_'; }
umask 077
sed -e "s|^_AIRFLOW_WWW_USER_PASSWORD=$|_AIRFLOW_WWW_USER_PASSWORD=$(secret)|" \
    -e "s|^AIRFLOW_FERNET_KEY=$|AIRFLOW_FERNET_KEY=$(fernet)|" \
    "$root/.env.example" > "$out.tmp"
while grep -q '^[A-Z_]*=$' "$out.tmp"; do
  sed -i "0,/^\([A-Z_]*\)=$/s//\1=$(secret)/" "$out.tmp"
done
mv "$out.tmp" "$out"
echo "wrote $out (mode 600); the Airflow admin password is its _AIRFLOW_WWW_USER_PASSWORD"
