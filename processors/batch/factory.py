from pycollector.component import Factory

from processors.batch.config import BatchConfig


class BatchProcessorFactory(Factory):
    type = "batch"
    signals = frozenset({"profiles", "traces", "metrics", "logs"})
    config_model = BatchConfig

    def create(self, settings, config, next_consumer):
        from processors.batch.processor import BatchProcessor

        return BatchProcessor(settings, config, next_consumer)


factory = BatchProcessorFactory()
