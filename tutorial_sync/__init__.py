"""Publish tutorials from git onto shared storage, read-only in every user container."""

#: Written by tutorial_sync.publish into every published version, read by the start hook:
#: the commit and ``{path: git blob id}`` of every file.
MANIFEST = ".tutorial-manifest.json"
