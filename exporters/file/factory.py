from pycollector.component import Factory

from exporters.file.config import FileConfig


class FileExporterFactory(Factory):
    type = "file"
    signals = frozenset({"profiles", "traces", "metrics", "logs"})
    config_model = FileConfig

    def create(self, settings, config, next_consumer):
        from exporters.file.exporter import FileExporter

        return FileExporter(settings, config)


factory = FileExporterFactory()
