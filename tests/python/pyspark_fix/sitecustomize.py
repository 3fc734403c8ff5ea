"""Put on the PYTHONPATH of the PySpark job (pyspark_job.py) and its Python workers.

PySpark 4.3.0's Python worker lowercases every configuration value it reads unless told
otherwise (``pyspark.worker_util.Conf.get``, ``lower_str=True``), the JSON of
``applyInPandasWithState``'s state schema included: ``"elementType"`` becomes
``"elementtype"`` and any state schema with an array fails in the worker with
``KeyError: 'elementType'`` (the book's job does). This reads that one value as the JVM
sent it; nothing else of PySpark changes.
"""

try:
    from pyspark import worker_util

    _get = worker_util.Conf.get

    def _get_state_schema_as_sent(self, key, default="", *, lower_str=True):
        if key == "state_value_schema":
            lower_str = False
        return _get(self, key, default, lower_str=lower_str)

    worker_util.Conf.get = _get_state_schema_as_sent
except ImportError:
    pass
