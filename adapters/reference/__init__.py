"""The reference continuous-batching engine: a scheduler on a roofline cost model, no GPU.

Plain Python: no asyncio, no HTTP, nothing from ``harness``. Entry points:
``EngineCore`` for driving steps (``harness.sim`` runs it on a virtual clock, ``harness.serve``
on the wall clock); ``costmodel_table`` / ``costmodel_report`` for ``batchlab costmodel``;
``prediction_record``: what every number it produces is a prediction of, and how accurate.
docs/cost-model.md explains the model and its constants.
"""

from adapters.reference.config import ConfigError, ReferenceConfig, SchedulerConfig
from adapters.reference.cost_model import CostModel, CostModelParams, ProfileError, load_profile
from adapters.reference.engine import STEP_COLUMNS, EngineCore, VirtualClock
from adapters.reference.hardware import GPUS, known_gpus
from adapters.reference.models import MODELS, known_models
from adapters.reference.prediction import catalog_accuracy, prediction_record
from adapters.reference.table import CostRow, costmodel_report, costmodel_table

__all__ = [
    "GPUS",
    "MODELS",
    "STEP_COLUMNS",
    "ConfigError",
    "CostModel",
    "CostModelParams",
    "CostRow",
    "EngineCore",
    "ProfileError",
    "ReferenceConfig",
    "SchedulerConfig",
    "VirtualClock",
    "catalog_accuracy",
    "costmodel_report",
    "costmodel_table",
    "known_gpus",
    "known_models",
    "load_profile",
    "prediction_record",
]
