"""Checkpoint audit: check a Hugging Face safetensors checkpoint from its headers, never its data."""

from envrun.checkpoint.audit import (
    AuditReport,
    CheckpointIndexError,
    audit_checkpoint,
    render_audit,
)
from envrun.checkpoint.layout import ModelConfigError, ModelLayout, load_layout
from envrun.checkpoint.safetensors_header import (
    SafetensorsHeader,
    SafetensorsHeaderError,
    TensorInfo,
    read_safetensors_header,
)

__all__ = [
    "AuditReport",
    "CheckpointIndexError",
    "ModelConfigError",
    "ModelLayout",
    "SafetensorsHeader",
    "SafetensorsHeaderError",
    "TensorInfo",
    "audit_checkpoint",
    "load_layout",
    "read_safetensors_header",
    "render_audit",
]
