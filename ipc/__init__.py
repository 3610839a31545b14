"""The wire: msgspec message structs shared by the controller and the instances."""
