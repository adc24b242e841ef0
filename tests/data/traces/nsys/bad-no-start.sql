-- Malformed: a kernel table without its 'start' column (everything else well-formed). Reading it must be an
-- InputError naming the file, the table CUPTI_ACTIVITY_KIND_KERNEL and the column 'start'.
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (end INTEGER NOT NULL, deviceId INTEGER NOT NULL, streamId INTEGER NOT NULL,
  correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL);
INSERT INTO StringIds VALUES (1, 'nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT');
INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (2250000, 0, 7, 1, 0, 1, 1);
