"""Developer scripts, run as files; the tests import ``scripts.render_manifests``."""
