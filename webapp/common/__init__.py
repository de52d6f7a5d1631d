"""What the apps share: domain errors and their JSON form, authentication, secrets."""
