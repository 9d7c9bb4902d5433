import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def test_seed_demo_creates_a_working_admin_login_and_is_idempotent(settings, tmp_path, capsys):
    settings.VAR_DIR = tmp_path
    call_command("seed_demo")
    call_command("seed_demo")
    user_model = get_user_model()
    assert user_model.objects.filter(username="admin").count() == 1
    username, password = (tmp_path / "demo-login.txt").read_text().split()
    admin = user_model.objects.get(username=username)
    assert admin.is_superuser
    assert admin.check_password(password)
    assert set(Group.objects.values_list("name", flat=True)) >= {"RevOps", "Sales managers"}
    assert f"{username} / {password}" in capsys.readouterr().out


def test_seed_demo_if_empty_leaves_a_used_database_alone(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    get_user_model().objects.create_user("someone", password="x")
    call_command("seed_demo", "--if-empty")
    assert not get_user_model().objects.filter(username="admin").exists()
