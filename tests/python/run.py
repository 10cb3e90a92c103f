"""Runs the Python client's tests (pytest, arguments passed on), or skips them with exit
code 77 and the reason when a module they need is missing."""

import importlib
import sys

MODULES = {"grpc": "python3-grpcio", "google.protobuf": "python3-protobuf", "numpy": "python3-numpy",
           "pytest": "python3-pytest"}

missing = []
for module, package in MODULES.items():
    try:
        importlib.import_module(module)
    except ImportError:
        missing.append(f"{module} (Debian: {package})")
if missing:
    print(f"SKIPPED: {sys.executable} lacks {', '.join(missing)}; deploy/install-deps.sh installs them")
    sys.exit(77)

import pytest  # noqa: E402

sys.exit(pytest.main(["-p", "no:cacheprovider", *sys.argv[1:]]))
