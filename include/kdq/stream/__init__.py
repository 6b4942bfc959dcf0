"""The speed layer's micro-batches, seen from outside Spark (pure Python: no Spark at import).

* :mod:`kdq.stream.state`: the stream's state folder (heartbeat, progress, push state, atomic JSON files);
* :mod:`kdq.stream.failures`: a failing or hung micro-batch, the supervisor's count of its attempts, the quarantine;
* :mod:`kdq.stream.checkpoint_offsets`: the Kafka offsets of its micro-batches, read from the Spark checkpoint;
* :mod:`kdq.stream.micro_batch`: one micro-batch's aggregate rows reduced to the increments its writers need.

The stream's own process (spark-submit, detached) is :mod:`kdq.spark.stream_process`: it builds on
:mod:`kdq.spark.submit`, and the Spark side imports this package.
"""
