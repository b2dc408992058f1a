"""Mooncake's and NIXL's Python APIs on tent, so the KV connectors written
against them (SGLang's and vLLM's) run unchanged.

- :mod:`tent.compat.mooncake`: ``TransferEngine`` (``mooncake.engine``'s API).
- :mod:`tent.compat.nixl`: ``nixl_agent``, ``nixl_agent_config``, the
  descriptor lists and error classes (``nixl._api`` / ``nixl._bindings``).
- :mod:`tent.compat.http_metadata` and ``python -m
  tent.compat.http_metadata_server``: Mooncake's HTTP metadata protocol.
- ``python -m tent.compat check``: which top-level shims (the
  ``tent-compat`` wheel's ``mooncake`` and ``nixl`` packages) are active.

docs/COMPAT.md has the switching guide and every call's status.
"""
