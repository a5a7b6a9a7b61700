from pycollector.component import Factory

from processors.batch.config import BatchConfig


class BatchProcessorFactory(Factory):
    type = "batch"
    signals = frozenset({"profiles", "traces", "metrics", "logs"})
    config_model = BatchConfig
    takes_serialized_profiles = True  # appends their bytes (pycollector.pdata.serialized.batch)

    def create(self, settings, config, next_consumer):
        from processors.batch.processor import BatchProcessor

        return BatchProcessor(settings, config, next_consumer)


factory = BatchProcessorFactory()
