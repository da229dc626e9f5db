"""The Celery workers: one thin task per pipeline layer, the driver, the steps and their ports."""
