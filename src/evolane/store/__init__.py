"""The durable store under ``.evolane/`` (DESIGN §7).

Content-addressed immutable blobs, directory trees as manifest blobs, crash-safe
whole-file JSON writes and append-only JSONL journals. Everything here is synchronous
file I/O: call it from trio through ``trio.to_thread.run_sync`` when it may block.
"""

from evolane.store._atomic import dump_json, read_json, write_bytes_atomic, write_json_atomic
from evolane.store._blobs import (
    CHUNK_SIZE,
    DEFAULT_MEDIA_TYPE,
    BlobId,
    BlobStore,
    CorruptBlobError,
    InvalidDigestError,
    MissingBlobError,
    StoreError,
    fsync_dir,
)
from evolane.store._journal import (
    MAX_RECORD_BYTES,
    Journal,
    JournalCorruptError,
    JournalError,
    JournalRead,
    TornLine,
    read_journal,
)
from evolane.store._trees import (
    TREE_MEDIA_TYPE,
    FileEntry,
    InvalidManifestError,
    Materialized,
    SymlinkEntry,
    TreeDiff,
    TreeEntry,
    TreeManifest,
    UnsafeEntryError,
    UnsupportedEntryError,
    diff_trees,
    load_manifest,
    materialize_tree,
    snapshot_tree,
    store_manifest,
)

__all__ = [
    "CHUNK_SIZE",
    "DEFAULT_MEDIA_TYPE",
    "MAX_RECORD_BYTES",
    "TREE_MEDIA_TYPE",
    "BlobId",
    "BlobStore",
    "CorruptBlobError",
    "FileEntry",
    "InvalidDigestError",
    "InvalidManifestError",
    "Journal",
    "JournalCorruptError",
    "JournalError",
    "JournalRead",
    "Materialized",
    "MissingBlobError",
    "StoreError",
    "SymlinkEntry",
    "TornLine",
    "TreeDiff",
    "TreeEntry",
    "TreeManifest",
    "UnsafeEntryError",
    "UnsupportedEntryError",
    "diff_trees",
    "dump_json",
    "fsync_dir",
    "load_manifest",
    "materialize_tree",
    "read_journal",
    "read_json",
    "snapshot_tree",
    "store_manifest",
    "write_bytes_atomic",
    "write_json_atomic",
]
