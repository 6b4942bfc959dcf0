#!/usr/bin/env bash
# Start-up of each of the compose file's three Kafka nodes (apache/kafka image,
# KRaft, broker and controller of one quorum).
#
# KRaft keeps SCRAM credentials in the metadata log, so the first users must be
# written when the log directory is formatted (kafka-storage format
# --add-scram); the image's own start-up formats without them. So on first
# start (no meta.properties yet) this script formats the directory itself,
# with the broker's user and kdq's user, from the same KAFKA_* variables the
# image turns into server.properties; the image's start-up, run next, then
# finds the directory formatted and goes on. Every node formats its own
# directory with the same cluster id and users (a static quorum:
# controller.quorum.voters). Later starts only write the admin client settings
# and hand over.
#
# Passwords must not contain ',', ']' or '"' (the --add-scram and JAAS
# syntaxes): generate them with `openssl rand -hex 32`.
set -euo pipefail

: "${CLUSTER_ID:?}" "${KAFKA_LOG_DIRS:?}"
: "${KDQ_KAFKA_USERNAME:?}" "${KDQ_KAFKA_PASSWORD:?}"
: "${KDQ_KAFKA_ADMIN_USERNAME:?}" "${KDQ_KAFKA_ADMIN_PASSWORD:?}"
kafka_bin=${KDQ_KAFKA_BIN:-/opt/kafka/bin}
umask 077

for password in "$KDQ_KAFKA_PASSWORD" "$KDQ_KAFKA_ADMIN_PASSWORD"; do
  case "$password" in
    *[,\]\"\\]*) echo "kafka: KDQ_KAFKA_PASSWORD / KDQ_KAFKA_ADMIN_PASSWORD must not contain , ] \" or \\" >&2; exit 1 ;;
  esac
done

# Client settings of the broker's own user: the health check, and operators'
# tools (kafka-topics.sh ... --command-config /tmp/kdq-admin.properties).
cat > /tmp/kdq-admin.properties <<PROPERTIES
security.protocol=SASL_PLAINTEXT
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="${KDQ_KAFKA_ADMIN_USERNAME}" password="${KDQ_KAFKA_ADMIN_PASSWORD}";
PROPERTIES

if [[ ! -e "${KAFKA_LOG_DIRS%%,*}/meta.properties" ]]; then
  # The image's rule for KAFKA_* variables: drop the prefix, lower-case,
  # _ -> ., ___ -> -, __ -> _ (KafkaDockerWrapper), minus its excluded ones.
  format_props=$(mktemp)
  trap 'rm -f "$format_props"' EXIT
  for name in $(compgen -e); do
    case "$name" in
      KAFKA_VERSION | KAFKA_HEAP_OPTS | KAFKA_LOG4J_OPTS | KAFKA_OPTS | KAFKA_JMX_OPTS \
        | KAFKA_JVM_PERFORMANCE_OPTS | KAFKA_GC_LOG_OPTS | KAFKA_LOG4J_ROOT_LOGLEVEL \
        | KAFKA_LOG4J_LOGGERS | KAFKA_TOOLS_LOG4J_LOGLEVEL | KAFKA_JMX_HOSTNAME) continue ;;
      KAFKA_*) ;;
      *) continue ;;
    esac
    key=${name#KAFKA_}
    key=${key,,}
    key=${key//_/.}
    key=${key//.../-}
    key=${key//../_}
    printf '%s=%s\n' "$key" "${!name}" >> "$format_props"
  done
  echo "===> Formatting ${KAFKA_LOG_DIRS} with SCRAM-SHA-512 users ${KDQ_KAFKA_ADMIN_USERNAME} and ${KDQ_KAFKA_USERNAME}"
  "$kafka_bin/kafka-storage.sh" format --cluster-id "$CLUSTER_ID" -c "$format_props" \
    --add-scram "SCRAM-SHA-512=[name=${KDQ_KAFKA_ADMIN_USERNAME},password=${KDQ_KAFKA_ADMIN_PASSWORD}]" \
    --add-scram "SCRAM-SHA-512=[name=${KDQ_KAFKA_USERNAME},password=${KDQ_KAFKA_PASSWORD}]"
  rm -f "$format_props"
  trap - EXIT
fi

exec /etc/kafka/docker/run "$@"
