"""``mooncake.http_metadata_server`` on tent: ``python -m
mooncake.http_metadata_server --port 8080`` (tent.compat.http_metadata_server)."""

import sys

from tent.compat.http_metadata_server import HTTPMetadataServer, main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
