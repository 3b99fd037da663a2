// Package truncate will hold divergence repair: detecting source log
// truncation, foreign writes and failback divergence, planning and carrying
// out repair (quarantine + rebuild), and computing last-mirrored positions
// (design.md section 8). Detection of foreign writes and of source/
// destination mismatches currently lives in the data path (package fetch),
// which marks a partition DIVERGED; repair comes with the failback issue.
package truncate
