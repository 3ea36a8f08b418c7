"""Checkpoint audit: check a Hugging Face safetensors checkpoint from its headers, never its data."""

from envrun.checkpoint.audit import CheckpointIndexError, audit_checkpoint
from envrun.checkpoint.expected import ExpectedNames, UnsupportedArchitectureError
from envrun.checkpoint.layout import ModelConfigError
from envrun.checkpoint.modelnames import ModelNames, ModelNamesError, ModelRefusedConfigError
from envrun.checkpoint.report import render_audit
from envrun.checkpoint.safetensors_header import SafetensorsHeaderError, read_safetensors_header

__all__ = [
    "CheckpointIndexError",
    "ExpectedNames",
    "ModelConfigError",
    "ModelNames",
    "ModelNamesError",
    "ModelRefusedConfigError",
    "SafetensorsHeaderError",
    "UnsupportedArchitectureError",
    "audit_checkpoint",
    "read_safetensors_header",
    "render_audit",
]
