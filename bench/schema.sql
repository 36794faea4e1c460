-- Tables for `make bench`.
create table items (id int primary key, label text not null, price numeric(10, 2) not null);
insert into items select g, 'item ' || g, g * 1.25 from generate_series(1, 10000) g;
analyze items;
