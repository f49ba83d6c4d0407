import os
import sys

# The package under test: bindings/python (GTP_LIBRARY or the Bazel output supplies libgtp.so).
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
