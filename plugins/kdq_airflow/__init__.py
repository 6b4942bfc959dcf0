"""kdq's Airflow pieces, in the provider style: operators store arguments and declare template fields,
hooks are created and connections resolved only in ``execute()``, and kdq/Spark modules are imported there
too, so that importing this package (what every DAG file does at parse time) stays cheap and side-effect free.
"""

from kdq_airflow.defaults import kdq_default_args, kdq_start_date
from kdq_airflow.operators import (
    InfluxCatchUpOperator,
    KdqSparkJobOperator,
    MaintenanceOperator,
    PushCorrectionsOperator,
)
from kdq_airflow.stream import EnsureStreamRunningOperator, StopStreamOperator

__all__ = [
    "EnsureStreamRunningOperator",
    "InfluxCatchUpOperator",
    "KdqSparkJobOperator",
    "MaintenanceOperator",
    "PushCorrectionsOperator",
    "StopStreamOperator",
    "kdq_default_args",
    "kdq_start_date",
]
