create table cats (id serial primary key, name text not null, age int, born date, weight real, indoor boolean, notes text);
insert into cats (name, age, born, weight, indoor, notes) values
  ('Tom', 3, '2021-04-01', 4.5, true, null),
  ('Bob', 7, '2017-09-12', 5.25, false, ''),
  ('Jerry', null, null, null, null, 'no data');
create table kv (k text primary key, v text);
create table items (id int primary key, label text not null);
insert into items select g, 'item ' || g from generate_series(1, 10000) g;
