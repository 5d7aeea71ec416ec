"""Turn-based text games as PettingZoo AEC envs (TicTacToe, ConnectFour, Kuhn poker)."""
