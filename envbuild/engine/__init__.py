"""The container engine: :mod:`.client` is the only code that talks to it (the docker SDK against
``DOCKER_HOST``); :mod:`.transfer` follows its long transfers as a person reads them."""
