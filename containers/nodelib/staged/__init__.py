"""A staged data set and the file server's versions of it: what the sync writes and the nodes read.

Staged (in Blob, or a datastore folder that mounts it): `datasets/<name>/manifest.jsonl` plus
`datasets/<name>/shards/<id>.tar`. The manifest lists every file (path, size, SHA-256, shard) and is
written last. On a file server (the NFS share, or a node's local disk):

    <export>/datasets/<name>/v-<version>/   one complete copy (train/, val/, .manifest.jsonl, .verified.json)
    <export>/datasets/<name>/current        symlink to the newest complete version: what training reads

The orchestrator's sync (tasks/sync_file_server.py) and the node-side fetch (`fetch.py`, what the Azure ML sync job
runs) share this package, so both write the same layout the same way; it needs only the standard library.

- `names`: the format's names: blobs, files, the data set's name.
- `rules`: what comes back from storage is input. Anyone who can write the container (a leaked SAS, a shared
  account, a data set someone else staged) controls the manifest and the shards, so every manifest row is checked
  before anything is written (a relative, normalised path under train/ or val/, a size, a SHA-256, a shard id);
  a violation is `UntrustedInput` (one line, never retried). The rules follow Python's tarfile data filter
  (PEP 706), which refuses absolute paths, `..`, links and devices.
- `manifest`: the manifest, indexed in SQLite a batch of rows at a time.
- `versions`: the file server's versions: the sync's decision, the checked extraction (every tar member a regular
  file, every file created new inside the version folder), the atomic switch of `current`.
- `fetch`: the node-side command.
"""
