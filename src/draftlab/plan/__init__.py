"""What a run takes before it runs: stage keys and folders, storage, memory and the SGLang flags."""
