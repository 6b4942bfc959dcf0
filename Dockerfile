# The Airflow image of the cluster deployment (docker-compose.yml): Airflow plus
# everything a task needs to act as a Spark driver in client mode (a JRE,
# pyspark's spark-submit), the kdq package itself, and the Spark jars kdq ships
# with every application (--jars): the Kafka connector and Delta, and kdq's own
# functions jar (the classifier), as scripts/setup.sh makes them for the tested
# cluster shape (docs/cluster.md). The same image runs the Spark master and
# workers.

# --- The jars, built with Maven from the repository's poms ----------------------
# jvm/spark-connectors: the connector and Delta jars (only the listed artifacts:
# their dependencies ship inside pyspark); jvm/hadoop-aws: the S3A connector for
# tables and checkpoints on s3a:// (paths.storage_uri, KDQ_STORAGE_URI in
# docker-compose.yml): hadoop-aws and the AWS SDK modules it uses (with its
# DynamoDB module), minus what pyspark ships, and kdq's DynamoDB log store
# (kdq-dynamodb: Delta commits of concurrent drivers on s3a://), as
# scripts/setup.sh's KDQ_SETUP_S3 step (`make setup-s3`) makes them;
# jvm/kdq-spark-functions: one shaded jar. Its tests (every reason, the
# JSON-Schema-Test-Suite) run in `make setup` and CI; not compiled or run here.
FROM maven:3.9-eclipse-temurin-17 AS jars
WORKDIR /build
# The modules' parent (shared versions and plugin versions), found on disk by each module below.
COPY jvm/pom.xml jvm/pom.xml
COPY jvm/spark-connectors/pom.xml jvm/spark-connectors/pom.xml
RUN mvn -q -B -f jvm/spark-connectors/pom.xml dependency:copy-dependencies \
        -DexcludeTransitive=true -DoutputDirectory=/opt/kdq/jars/spark
COPY jvm/hadoop-aws/pom.xml jvm/hadoop-aws/pom.xml
RUN mvn -q -B -f jvm/hadoop-aws/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
        -DexcludeGroupIds=io.netty,org.slf4j,commons-logging,commons-codec,org.apache.httpcomponents,com.fasterxml.jackson.core,joda-time \
        -DoutputDirectory=/opt/kdq/jars/hadoop-aws
COPY jvm/hadoop-aws/kdq-dynamodb/pom.xml jvm/hadoop-aws/kdq-dynamodb/pom.xml
COPY jvm/hadoop-aws/kdq-dynamodb/src jvm/hadoop-aws/kdq-dynamodb/src
RUN mvn -q -B -f jvm/hadoop-aws/kdq-dynamodb/pom.xml -Dmaven.test.skip=true package \
    && cp jvm/hadoop-aws/kdq-dynamodb/target/kdq-dynamodb.jar /opt/kdq/jars/hadoop-aws/
COPY jvm/kdq-spark-functions/pom.xml jvm/kdq-spark-functions/pom.xml
COPY jvm/kdq-spark-functions/src jvm/kdq-spark-functions/src
RUN mvn -q -B -f jvm/kdq-spark-functions/pom.xml -Dmaven.test.skip=true package \
    && mkdir -p /opt/kdq/jars/kdq \
    && cp jvm/kdq-spark-functions/target/kdq-spark-functions.jar /opt/kdq/jars/kdq/

# --- Airflow, Spark (pyspark) and kdq ---------------------------------------------
FROM apache/airflow:3.3.2-python3.11

USER root
# pyspark launches a JVM for the driver; 17 is the Java version Spark 4 and
# Delta are built and tested with.
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && ln -s "/usr/lib/jvm/java-17-openjdk-$(dpkg --print-architecture)" /usr/lib/jvm/java-17 \
    && apt-get autoremove -yqq --purge \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /opt/kdq/data \
    && chown airflow:0 /opt/kdq/data
ENV JAVA_HOME=/usr/lib/jvm/java-17

# paths.jars_dir's layout (spark/*.jar, hadoop-aws/*.jar,
# kdq/kdq-spark-functions.jar): kdq finds them there for a local master (the SQL
# endpoint), and the compose file's spark.jars names them for the standalone
# master.
COPY --from=jars /opt/kdq/jars /opt/kdq/jars
ENV KDQ_PATHS__JARS_DIR=/opt/kdq/jars

USER airflow
# Dependencies first, in their own layer: code edits then do not reinstall them.
# Naming apache-airflow with the image's version keeps pip from swapping the
# Airflow the image was built with for another one a requirement would allow.
COPY --chown=airflow:0 requirements.txt /opt/airflow/requirements.txt
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" -r /opt/airflow/requirements.txt

# The project at the paths docker-compose.yml mounts over it (dags, plugins,
# include, spark_jobs, config, kdq.toml), so the editable install resolves
# `kdq` to the mounted include/kdq during development and to the copied one
# when the image runs without mounts. The whole context, not folder by folder:
# git keeps no empty folders, and a COPY of a missing one fails the build.
COPY --chown=airflow:0 . /opt/airflow/
RUN pip install --no-cache-dir --no-deps -e /opt/airflow

ENV KDQ_CONFIG=/opt/airflow/kdq.toml
