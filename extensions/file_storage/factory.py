from pycollector.component import Factory

from extensions.file_storage.config import FileStorageConfig


class FileStorageExtensionFactory(Factory):
    type = "file_storage"
    config_model = FileStorageConfig

    def create(self, settings, config, next_consumer):
        from extensions.file_storage.extension import FileStorageExtension

        return FileStorageExtension(settings, config)


factory = FileStorageExtensionFactory()
