package broker

func enableReplicaReads(*Config) {}
