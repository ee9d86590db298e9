"""Pretrained backbones from timm, loaded from a local weights file (docs/pretrained.md): the backbone
table, weight files, the preprocessing the backbone expects, and the frozen-feature stream with its disk cache."""
