from pycollector.component import Factory

from processors.memory_limiter.config import MemoryLimiterConfig


class MemoryLimiterFactory(Factory):
    type = "memory_limiter"
    signals = frozenset({"profiles", "traces", "metrics", "logs"})
    config_model = MemoryLimiterConfig
    takes_serialized_profiles = True  # passes them on as they came

    def create(self, settings, config, next_consumer):
        from processors.memory_limiter import memory
        from processors.memory_limiter.limiter import MemoryLimiter, limits_for

        return MemoryLimiter(settings, config, next_consumer, limits_for(config, memory.available_bytes, settings.worker.count))


factory = MemoryLimiterFactory()
