// placeholder until the rules land
