"""The sharding vocabulary: meshes, tensor layouts, reshard steps, sharding rules and repeated layers.

Torch-free: ``mesh`` and ``spec`` name where tensors live, ``reshard`` turns one layout into
another as collective steps, ``rules`` (with ``rules_base`` and ``rules_shapes``) turns the op
table in ``specs/ops.toml`` into strategies, ``layers`` finds identical repeated blocks.
"""
