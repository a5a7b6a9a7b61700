"""What exporters share: a sending queue with consumer threads, retry with backoff, and the
Go collector's ``retry_on_failure`` / ``sending_queue`` config sections (``RetrySettings``,
``QueueSettings``).

    class MyConfig(ComponentConfig):
        endpoint: str = "..."
        retry_on_failure: RetrySettings = RetrySettings()
        sending_queue: QueueSettings = QueueSettings()

    class MyExporter(Component):
        reports_sent_items = True          # the helper counts sent / send_failed itself
        def __init__(self, settings, config):
            self.sender = QueuedRetryExporter(settings, config.retry_on_failure, config.sending_queue, self._send)
        def _send(self, data): ...         # raise RetryableSendError or PermanentError
        def start(self, host): self.sender.start()
        def consume(self, data): self.sender.consume(data)
        def shutdown(self): self.sender.shutdown()
"""

from pycollector.exporterhelper.config import QueueSettings, RetrySettings
from pycollector.exporterhelper.sender import QueuedRetryExporter, RetryableSendError

__all__ = ["QueueSettings", "QueuedRetryExporter", "RetrySettings", "RetryableSendError"]
