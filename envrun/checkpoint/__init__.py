"""Checkpoint audit: check a Hugging Face safetensors checkpoint from its headers, never its data."""

from envrun.checkpoint.audit import AuditReport, CheckpointIndexError, audit_checkpoint
from envrun.checkpoint.expected import ExpectedNames, NameSource, UnsupportedArchitectureError
from envrun.checkpoint.layout import ModelConfigError, ModelLayout, load_layout
from envrun.checkpoint.modelnames import ModelNames, ModelNamesError, ModelRefusedConfigError, script_text
from envrun.checkpoint.report import render_audit
from envrun.checkpoint.safetensors_header import (
    SafetensorsHeader,
    SafetensorsHeaderError,
    TensorInfo,
    read_safetensors_header,
)

__all__ = [
    "AuditReport",
    "CheckpointIndexError",
    "ExpectedNames",
    "ModelConfigError",
    "ModelLayout",
    "ModelNames",
    "ModelNamesError",
    "ModelRefusedConfigError",
    "NameSource",
    "SafetensorsHeader",
    "SafetensorsHeaderError",
    "TensorInfo",
    "UnsupportedArchitectureError",
    "audit_checkpoint",
    "load_layout",
    "read_safetensors_header",
    "render_audit",
    "script_text",
]
