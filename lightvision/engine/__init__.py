"""Training infrastructure shared by classify and diffusion: config, checkpoints, guards, logging, the loop, and
the per-batch randomness that does not depend on the number of processes (``batch_random``)."""

from lightvision.engine.batch_random import BatchRandom, batch_random, use_batch_random
from lightvision.engine.checkpoint import (
    CheckpointError,
    CheckpointManager,
    load_model_weights,
    read_checkpoint_config,
    resolve_checkpoint,
    unwrap_model,
    verify_checkpoint,
)
from lightvision.engine.compiled import compile_model
from lightvision.engine.config import ConfigError, load_config, parse_value, save_config, upgrade_config
from lightvision.engine.ema import ModelEma
from lightvision.engine.guards import NonFiniteError, check_finite
from lightvision.engine.metrics import MetricsLogger
from lightvision.engine.trainer import Trainer, make_accelerator

__all__ = [
    "BatchRandom",
    "CheckpointError",
    "CheckpointManager",
    "ConfigError",
    "MetricsLogger",
    "ModelEma",
    "NonFiniteError",
    "Trainer",
    "batch_random",
    "check_finite",
    "compile_model",
    "load_config",
    "load_model_weights",
    "make_accelerator",
    "parse_value",
    "read_checkpoint_config",
    "resolve_checkpoint",
    "save_config",
    "unwrap_model",
    "upgrade_config",
    "use_batch_random",
    "verify_checkpoint",
]
