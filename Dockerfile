# The Airflow image of the cluster deployment (docker-compose.yml): Airflow plus
# everything a task needs to act as a Spark driver in client mode (a JRE,
# pyspark's spark-submit) and the kdq package itself.
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
