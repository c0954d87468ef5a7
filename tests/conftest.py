import os
import sys

# Tests import the project from the checkout, installed or not.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
