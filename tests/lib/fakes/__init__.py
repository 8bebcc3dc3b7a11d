"""Loopback fakes of cloud services, for tests: they speak the real wire formats on 127.0.0.1."""
