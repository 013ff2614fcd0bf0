"""The metadata service: namespace, block maps, placement and the chunk-server registry."""

from .service import MetadataService

__all__ = ["MetadataService"]
