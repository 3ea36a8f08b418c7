"""The only code that talks to a container registry over its HTTP API (OCI distribution): what a tag
names now, for `lock update` to pin a base image without a container engine."""
