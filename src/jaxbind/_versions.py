"""The range of JAX versions jaxbind supports; pyproject.toml and .ci/ agree with it."""

OLDEST_SUPPORTED_JAX = "0.7.0"  # also the jaxlib whose FFI headers the extension is built with
NEWEST_TESTED_JAX = "0.12.0.1"  # newer ones work but warn once (see _buildcheck.check_jax_version)
