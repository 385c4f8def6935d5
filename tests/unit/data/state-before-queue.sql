PRAGMA foreign_keys=OFF;
BEGIN TRANSACTION;
CREATE TABLE clusters (
	id INTEGER NOT NULL, 
	name VARCHAR(64) NOT NULL, 
	gpu VARCHAR(32) NOT NULL, 
	count INTEGER NOT NULL, 
	nodes INTEGER NOT NULL, 
	network VARCHAR(16) NOT NULL, 
	disk_bytes INTEGER NOT NULL, 
	backend VARCHAR(16) NOT NULL, 
	price_book VARCHAR(32), 
	usd_per_hour FLOAT NOT NULL, 
	status VARCHAR(16) NOT NULL, 
	created_at FLOAT NOT NULL, 
	started_at FLOAT, 
	stopped_at FLOAT, 
	scratch_dir TEXT NOT NULL, 
	spec_json TEXT NOT NULL, 
	for_job VARCHAR(64), 
	banked_usd FLOAT, 
	rate_since FLOAT, 
	pool VARCHAR(64), 
	simulated BOOLEAN, 
	owner_pid INTEGER, 
	owner_started FLOAT, 
	PRIMARY KEY (id)
);
INSERT INTO clusters VALUES(1,'run-7f8f','cpu',1,1,'pcie',1000000000,'local','hyperscaler',0.044624999999999998001,'stopped',1796192957.5935795306,1796192957.5935795306,1796192961.9158186911,'/tmp/oldhome/clusters/run-7f8f','{"name":"run-7f8f","gpu":"cpu","count":1,"network":null,"nodes":null,"disk":"1GB","backend":"local","pool":null,"price_book":null}','old-job',0.0,NULL,NULL,0,NULL,NULL);
CREATE TABLE pools (
	id INTEGER NOT NULL, 
	name VARCHAR(64) NOT NULL, 
	kind VARCHAR(16) NOT NULL, 
	address VARCHAR(128), 
	spec_json TEXT NOT NULL, 
	created_at FLOAT NOT NULL, 
	is_default BOOLEAN NOT NULL, 
	managed BOOLEAN NOT NULL, 
	PRIMARY KEY (id), 
	UNIQUE (name)
);
CREATE TABLE metrics (
	id INTEGER NOT NULL, 
	time FLOAT NOT NULL, 
	cluster VARCHAR(64) NOT NULL, 
	job VARCHAR(64) NOT NULL, 
	node VARCHAR(64) NOT NULL, 
	rank INTEGER NOT NULL, 
	name VARCHAR(64) NOT NULL, 
	value FLOAT NOT NULL, 
	device VARCHAR(32), 
	resolution FLOAT, 
	PRIMARY KEY (id)
);
CREATE TABLE reservations (
	id INTEGER NOT NULL, 
	cluster_id INTEGER NOT NULL, 
	pool VARCHAR(64) DEFAULT 'local' NOT NULL, 
	node_id VARCHAR(64) NOT NULL, 
	address VARCHAR(64) NOT NULL, 
	device_id VARCHAR(32) NOT NULL, 
	device_index INTEGER NOT NULL, 
	PRIMARY KEY (id), 
	UNIQUE (pool, node_id, device_id), 
	FOREIGN KEY(cluster_id) REFERENCES clusters (id)
);
CREATE TABLE jobs (
	id INTEGER NOT NULL, 
	name VARCHAR(64) NOT NULL, 
	cluster_id INTEGER NOT NULL, 
	status VARCHAR(16) NOT NULL, 
	spec_json TEXT NOT NULL, 
	job_dir TEXT NOT NULL, 
	world_size INTEGER NOT NULL, 
	created_at FLOAT NOT NULL, 
	started_at FLOAT, 
	ended_at FLOAT, 
	exit_code INTEGER, 
	supervisor_pid INTEGER, 
	supervisor_started FLOAT, 
	creator_pid INTEGER, 
	creator_started FLOAT, 
	step INTEGER, 
	total_steps INTEGER, 
	samples INTEGER NOT NULL, 
	loss FLOAT, 
	first_loss FLOAT, 
	samples_per_s FLOAT, 
	first_step INTEGER, 
	first_step_at FLOAT, 
	last_report_at FLOAT, 
	reason TEXT, 
	layout_seen VARCHAR(32), 
	PRIMARY KEY (id), 
	UNIQUE (name), 
	FOREIGN KEY(cluster_id) REFERENCES clusters (id)
);
INSERT INTO jobs VALUES(1,'old-job',1,'succeeded','{"script":"/tmp/q1/sleepy.py","args":["1"],"name":"old-job","cluster":{"name":null,"gpu":"cpu","count":1,"network":null,"nodes":null,"disk":"1GB","backend":"local","pool":null,"price_book":null},"workers_per_node":null,"strategy":"ddp","dp":null,"tp":null,"pp":null,"pp_schedule":"1f1b","microbatches":null,"precision":"fp32","framework":"torchrun","model":null,"env":{},"max_restarts":0,"hang_timeout":"5m","checkpoint_to":null,"workers":null,"scale_up_util":0.9,"scale_down_util":0.5,"cooldown":"60s","keep":false,"bootstrap":true,"total_steps":null,"loss_pattern":null,"workdir":"/tmp/oldgf"}','/tmp/oldhome/jobs/old-job',1,1796192957.6048383713,1796192957.6257007122,1796192961.909861803,0,16240,1796192956.8299999236,16240,1796192956.8299999236,NULL,NULL,0,NULL,NULL,NULL,NULL,NULL,NULL,'all workers exited 0',NULL);
CREATE TABLE job_events (
	id INTEGER NOT NULL, 
	job_id INTEGER NOT NULL, 
	time FLOAT NOT NULL, 
	kind VARCHAR(32) NOT NULL, 
	reason TEXT NOT NULL, 
	PRIMARY KEY (id), 
	FOREIGN KEY(job_id) REFERENCES jobs (id)
);
INSERT INTO job_events VALUES(1,1,1796192957.6048383713,'starting','1 worker(s) on cluster run-7f8f');
INSERT INTO job_events VALUES(2,1,1796192957.6257007122,'running','1 worker(s) on run-7f8f');
INSERT INTO job_events VALUES(3,1,1796192961.909861803,'succeeded','all workers exited 0');
CREATE TABLE findings (
	id INTEGER NOT NULL, 
	job_id INTEGER NOT NULL, 
	"key" VARCHAR(96) NOT NULL, 
	rule VARCHAR(32) NOT NULL, 
	severity VARCHAR(16) NOT NULL, 
	subject VARCHAR(64) NOT NULL, 
	title TEXT NOT NULL, 
	detail TEXT NOT NULL, 
	fix TEXT NOT NULL, 
	first_seen FLOAT NOT NULL, 
	last_seen FLOAT NOT NULL, 
	active BOOLEAN NOT NULL, 
	PRIMARY KEY (id), 
	UNIQUE (job_id, "key"), 
	FOREIGN KEY(job_id) REFERENCES jobs (id)
);
CREATE INDEX ix_clusters_name ON clusters (name);
CREATE INDEX ix_metrics_job_name_time ON metrics (job, name, time);
CREATE INDEX ix_job_events_job_id ON job_events (job_id);
CREATE INDEX ix_findings_job_id ON findings (job_id);
COMMIT;
