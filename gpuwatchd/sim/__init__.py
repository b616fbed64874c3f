"""The simulated node: scenario files, a hardware model, a fake NVML library
under the real nvidia-ml-py, and a sysfs tree of InfiniBand ports."""
