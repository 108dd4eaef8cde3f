# pytest plugin (-p gpu_spread): each xdist worker on its own GPU, worker i on GPU i % SPREAD_GPUS
# (set before anything in the worker touches CUDA; torch initialises CUDA lazily)
import os


def pytest_configure(config):
    worker, n = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("SPREAD_GPUS", "1"))
    if worker and n > 1:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(int(worker[2:]) % n)
