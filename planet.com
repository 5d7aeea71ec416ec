0.00038445127723571747 : Mass of the planets (in mstar)
69.08539245482079 : Semi-major axes
0.6235356405558324 : Eccentricities
61.721675974814914 : Inclinaison (deg)
1 : is Inclinaison damping?
1 : planets feel Disk ?
1 : planets feel others ?
0 : Accretion onto planets ?
1.66 : Accretion parameter
0.001 : Maximum mass of the planet
0.4 : Smoothing
1.0 : Region excluded from torque calculation
