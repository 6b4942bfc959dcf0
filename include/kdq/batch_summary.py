"""Old name of :mod:`kdq.micro_batch`, kept only until ``kdq.spark.speed_layer`` imports the new one.

"Summary" is the streaming summaries' word (:mod:`kdq.summaries`); what this module held is a micro-batch
reduced to its increments. Import ``increments_of`` / ``MicroBatchIncrements`` from :mod:`kdq.micro_batch`.
"""

from kdq.micro_batch import MicroBatchIncrements as BatchSummary
from kdq.micro_batch import increments_of as summarize
from kdq.micro_batch import merge_maxima

__all__ = ["BatchSummary", "merge_maxima", "summarize"]
