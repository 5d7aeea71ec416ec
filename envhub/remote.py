class RemoteEnv: pass
