"""Diffusion tests run offline: nothing may reach the hub."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["DIFFUSERS_OFFLINE"] = "1"
