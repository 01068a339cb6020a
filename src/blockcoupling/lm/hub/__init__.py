"""The hub room: fetching model revisions and prompt datasets (``fetch``), the cache folders and
their manifests (``cache``), repo ids and revisions as the hub accepts them (``names``), the
revisions a config names and their fetch order (``revisions``), the lock file (``lock``) and the
hub's content hashes (``content``).
"""
