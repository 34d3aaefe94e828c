"""Publish tutorials from git onto shared storage, read-only in every user container."""
